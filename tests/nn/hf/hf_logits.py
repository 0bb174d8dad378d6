"""Loads a Hugging Face model folder with transformers and writes the logits for input ids.

  python hf_logits.py MODEL_DIR IO_FILE     # IO_FILE: safetensors with "input_ids" (B, T) i64;
                                            # "logits" (B, T, V) f32 is added to it
tests/nn/hf_format_test.cc runs this on tessel's export, when a Python with transformers exists.
"""
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def main(model_dir, io_file):
    # transformers 5 renamed torch_dtype to dtype.
    major = int(transformers.__version__.split(".")[0])
    dtype = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                 **dtype).eval()
    io = load_file(io_file)
    with torch.no_grad():
        logits = model(input_ids=io["input_ids"]).logits.float().contiguous()
    save_file({"input_ids": io["input_ids"], "logits": logits}, io_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

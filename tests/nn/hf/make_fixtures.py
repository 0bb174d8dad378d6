"""Makes the Hugging Face fixtures tests/nn/hf_format_test.cc reads (run by scripts/hf_fixtures.sh).

Each fixture is a tiny random model built locally from a config (no hub access), saved with
save_pretrained (safetensors), plus io.safetensors: "input_ids" (B, T) i64 and the "logits"
(B, T, V) f32 that transformers computes for them in f32 with eager attention. Weights saved in
bf16 or f16 are rounded to that dtype before the logits are computed, so a loader that widens
them to f32 must reproduce the logits within f32 rounding.

  python make_fixtures.py OUT_DIR          # writes OUT_DIR/<name>/ for every fixture
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def llama(kv_heads, tied, rope_scaling):
    # head_dim 8 at theta 10000 has wavelengths 6.3, 63, 628, 6283: with an original context of
    # 64, llama3 scaling keeps the first, interpolates the second and stretches the others.
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=8,
                       max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                       rope_scaling=rope_scaling, tie_word_embeddings=tied, hidden_act="silu")


FIXTURES = {
    # name: (config, dtype the weights are saved in, max_shard_size or None)
    "llama_gqa_untied": (llama(2, False, None), torch.float32, "30KB"),  # sharded: an index
    "llama_mha_tied": (llama(4, True, None), torch.float32, None),
    "llama_gqa_tied_llama3": (llama(2, True, LLAMA3), torch.bfloat16, None),
    "llama_mha_untied_llama3": (llama(4, False, LLAMA3), torch.float16, None),
    "gpt2": (GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0),
               torch.float32, None),
}


def build(config):
    config._attn_implementation = "eager"
    cls = GPT2LMHeadModel if isinstance(config, GPT2Config) else LlamaForCausalLM
    return cls(config).eval()


def randomise(model):
    # Norm weights and biases away from their 1/0 initial values, so a swapped or dropped one
    # shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)


def main(out_dir):
    torch.manual_seed(31)
    for name, (config, dtype, shard) in FIXTURES.items():
        model = build(config)
        randomise(model)
        model = model.to(dtype).to(torch.float32)  # the values the saved dtype can hold
        ids = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float().contiguous()
        path = os.path.join(out_dir, name)
        kwargs = {"safe_serialization": True}
        if shard:
            kwargs["max_shard_size"] = shard
        model.to(dtype).save_pretrained(path, **kwargs)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(path, extra)):
                os.remove(os.path.join(path, extra))
        save_file({"input_ids": ids.contiguous(), "logits": logits},
                  os.path.join(path, "io.safetensors"))
        print(name, sorted(os.listdir(path)))


if __name__ == "__main__":
    main(sys.argv[1])

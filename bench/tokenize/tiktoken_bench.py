"""tiktoken's side of bench/tokenize: encodes the same text with the same ranks file and
pattern as the C++ bench, single-threaded (encode_ordinary of each chunk) and multi-threaded
(encode_ordinary_batch over the same chunks), and prints one JSON line of medians.

    python tiktoken_bench.py RANKS PATTERN_FILE TEXT CHUNKS_FILE THREADS REPEATS
"""
import base64
import json
import statistics
import sys
import time

import tiktoken


def main():
    ranks_path, pattern_path, text_path, chunks_path, threads, repeats = sys.argv[1:7]
    threads, repeats = int(threads), int(repeats)
    ranks = {}
    with open(ranks_path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    pattern = open(pattern_path, encoding="utf-8").read()
    enc = tiktoken.Encoding("bench", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    data = open(text_path, "rb").read()
    # The chunk boundaries the C++ side chose (byte offsets), so both encode the same pieces.
    cuts = [int(x) for x in open(chunks_path).read().split()]
    chunks = [data[a:b].decode("utf-8") for a, b in zip(cuts, cuts[1:])]
    single, multi, tokens = [], [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = sum(len(enc.encode_ordinary(c)) for c in chunks)
        single.append(time.perf_counter() - start)
        start = time.perf_counter()
        enc.encode_ordinary_batch(chunks, num_threads=threads)
        multi.append(time.perf_counter() - start)
    print(json.dumps({"version": tiktoken.__version__, "tokens": tokens,
                      "single_s": statistics.median(single), "multi_s": statistics.median(multi)}))


if __name__ == "__main__":
    main()

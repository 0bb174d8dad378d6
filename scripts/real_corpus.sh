#!/usr/bin/env bash
# The demo's real corpus: the Debian Reference (Osamu Aoki and contributors, GPL-2+), human-written
# English prose about the Debian system, as Debian's package debian-reference-en ships it
# (/usr/share/debian-reference/debian-reference.en.txt.gz; scripts/setup.sh installs it).
# Origin and licence: examples/data/debian-reference.md and docs/data.md.
#
#   scripts/real_corpus.sh OUT_DIR [TESSEL_TOKENIZE]
#
# Writes OUT_DIR/text/doc_NNN.txt, one document per numbered section (93; the rows of the
# manual's ASCII tables left out), and
# OUT_DIR/bytes.tiktoken: the 256 single bytes as a tiktoken ranks file (byte-level tokens, no
# merges; no GPT-2 vocabulary can be had offline here), with <|endoftext|> = 256 as the document
# separator. With TESSEL_TOKENIZE (a path to tessel-tokenize) it also tokenizes them into
# OUT_DIR/shards/train_*.bin (the first 90 % of the documents) and OUT_DIR/shards/val_*.bin.
set -euo pipefail
out=${1:?usage: scripts/real_corpus.sh OUT_DIR [TESSEL_TOKENIZE]}
tokenize=${2:-}
source=/usr/share/debian-reference/debian-reference.en.txt.gz
if [[ ! -r $source ]]; then
  echo "real_corpus: $source is missing: apt-get install debian-reference-en (scripts/setup.sh)" >&2
  exit 1
fi
rm -rf "$out/text" "$out/shards"
mkdir -p "$out/text"
# A new document at every section heading ("1.2.<no-break space>Title").
zcat "$source" | LC_ALL=C awk -v dir="$out/text" '
  /^[0-9]+\.[0-9]+\.\xc2\xa0/ { n++ }
  /^ *[|+]/ { next }  # the rows of the ASCII tables (package lists): not prose
  { printf "%s\n", $0 > sprintf("%s/doc_%03d.txt", dir, n) }'
for i in $(seq 0 255); do
  printf '%s %d\n' "$(printf "\\x$(printf %02x "$i")" | base64)" "$i"
done >"$out/bytes.tiktoken"
docs=("$out"/text/doc_*.txt)
val_from=$((${#docs[@]} * 9 / 10))
echo "real_corpus: $(cat "${docs[@]}" | wc -c) bytes of the Debian Reference in ${#docs[@]} documents" \
  "(${val_from} train, $((${#docs[@]} - val_from)) validation) under $out/text"
if [[ -n $tokenize ]]; then
  for split in train val; do
    if [[ $split == train ]]; then files=("${docs[@]:0:val_from}"); else files=("${docs[@]:val_from}"); fi
    "$tokenize" --tiktoken "$out/bytes.tiktoken" --pattern gpt2 --special '<|endoftext|>=256' \
      --doc-separator '<|endoftext|>' --out "$out/shards" --prefix "$split" "${files[@]}"
  done
fi

#!/usr/bin/env python3
"""Writes corpus.txt: a few hundred KB of project-written English for examples/train_gpt.

The text is generated, not copied: short tales about a lighthouse village, composed from word
lists and sentence templates written for tessel, with a fixed seed so the output is the same on
every run. It has real structure for a small byte-level GPT to learn (spelling, grammar, recurring
names, dialogue punctuation) while staying far from trivial.

    python3 examples/data/make_corpus.py            # rewrites examples/data/corpus.txt
"""
import os
import random

SEED = 1729
TARGET_BYTES = 320_000

NAMES = ["Ada", "Bram", "Cora", "Dov", "Edda", "Finn", "Greta", "Hugo", "Ines", "Jory",
         "Kaia", "Lev", "Mira", "Nils", "Odile", "Pim"]
TRADES = ["fisher", "baker", "weaver", "keeper of the lamp", "net mender", "boat builder",
          "teacher", "miller", "carpenter", "ferry pilot"]
PLACES = ["the harbour", "the old mill", "the market square", "the lighthouse", "the dunes",
          "the chapel yard", "the bridge over the creek", "the salt flats", "the north pier",
          "the orchard"]
THINGS = ["a lantern", "a copper kettle", "a map of the reefs", "a basket of pears",
          "a coil of rope", "a wooden flute", "a letter sealed with wax", "a brass compass",
          "a loaf of rye bread", "a jar of honey", "a broken oar", "a blue scarf"]
WEATHER = ["the fog rolled in from the sea", "a cold wind rattled the shutters",
           "the sun sat low and orange over the water", "rain drummed on the tin roofs",
           "the tide pulled far out and left the mud shining", "snow drifted over the nets",
           "the stars came out one by one", "thunder muttered beyond the islands"]
FEELINGS = ["glad", "worried", "curious", "tired", "proud", "restless", "calm", "uneasy"]
VERBS = ["carried", "found", "mended", "sold", "hid", "painted", "lost", "traded"]
TIMES = ["At dawn", "Before noon", "In the afternoon", "Toward evening", "Late at night",
         "On the first day of spring", "When the bells rang", "After the storm"]
SAYINGS = ["The sea keeps what it is given.", "A lamp is only as good as its keeper.",
           "Mend the net before the fish arrive.", "Bread tastes best when it is shared.",
           "Count the waves, not the worries.", "Every reef was once a mountain."]


def pick(rng, items):
    return rng.choice(items)


def sentence(rng, cast):
    a, b = rng.sample(cast, 2)
    kind = rng.randrange(9)
    if kind == 0:
        return f"{pick(rng, TIMES)}, {a} {pick(rng, VERBS)} {pick(rng, THINGS)} near {pick(rng, PLACES)}."
    if kind == 1:
        return f"{a} was {pick(rng, FEELINGS)}, because {pick(rng, WEATHER)}."
    if kind == 2:
        return f"\"Have you seen {pick(rng, THINGS)}?\" {a} asked. \"It was by {pick(rng, PLACES)},\" said {b}."
    if kind == 3:
        return f"{b} the {pick(rng, TRADES)} walked to {pick(rng, PLACES)} with {a}."
    if kind == 4:
        return f"{a} told {b} what the old people say: {pick(rng, SAYINGS)}"
    if kind == 5:
        n = rng.randrange(2, 12)
        return f"{a} counted {n} boats in {pick(rng, PLACES)} and wrote the number in a book."
    if kind == 6:
        return f"{pick(rng, TIMES)}, {pick(rng, WEATHER)}, and {a} stayed inside."
    if kind == 7:
        return f"\"I am {pick(rng, FEELINGS)} today,\" said {a}. {b} nodded and said nothing."
    return f"{a} gave {b} {pick(rng, THINGS)}, and {b} gave {a} {pick(rng, THINGS)} in return."


def tale(rng, number):
    cast = rng.sample(NAMES, 4)
    topic = pick(rng, ["lamp", "tide", "reef", "mill", "orchard", "storm", "ferry", "bells"])
    lines = [f"Tale {number}: {cast[0]} and the {topic}", ""]
    for _ in range(rng.randrange(3, 6)):
        lines.append(" ".join(sentence(rng, cast) for _ in range(rng.randrange(3, 7))))
        lines.append("")
    return "\n".join(lines) + "\n"


def main():
    rng = random.Random(SEED)
    parts, size, number = [], 0, 1
    while size < TARGET_BYTES:
        t = tale(rng, number)
        parts.append(t)
        size += len(t.encode())
        number += 1
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")
    with open(path, "w", encoding="ascii") as f:
        f.write("".join(parts))
    print(f"wrote {path}: {size} bytes, {number - 1} tales")


if __name__ == "__main__":
    main()

"""A short allocation-bound Python workload for bench/run_real.py's python3
row (run under PYTHONMALLOC=malloc, so every object is a malloc and a free):
dicts, lists, tuples, strings, class instances, JSON round trips, sorting
and a regex scan, deterministic, about a second on glibc.

    python3 py_objects.py [ROUNDS [DEPTH]]

DEPTH > 0 runs it under DEPTH nested calls through C (each one a `map`
over a one-element list), as a test runner's deep stacks are: every
allocation then has about 3 * DEPTH more C frames above it."""

import json
import random
import re
import sys


class Node:
    __slots__ = ("key", "left", "right")

    def __init__(self, key):
        self.key = key
        self.left = self.right = None


def insert(root, key):
    if root is None:
        return Node(key)
    node = root
    while True:
        side = "left" if key < node.key else "right"
        nxt = getattr(node, side)
        if nxt is None:
            setattr(node, side, Node(key))
            return root
        node = nxt


def depth(node):
    return 0 if node is None else 1 + max(depth(node.left), depth(node.right))


def main(rounds):
    rnd = random.Random(11)
    words = ["".join(rnd.choice("abcdefghij") for _ in range(rnd.randint(3, 9))) for _ in range(2000)]
    total = 0
    for r in range(rounds):
        records = [{"id": i, "name": rnd.choice(words), "tags": [rnd.choice(words) for _ in range(3)],
                    "score": rnd.random()} for i in range(3000)]
        text = json.dumps(records)
        back = json.loads(text)
        back.sort(key=lambda d: (d["name"], -d["score"]))
        counts = {}
        for d in back:
            for t in d["tags"]:
                counts[t] = counts.get(t, 0) + 1
        root = None
        for k in rnd.sample(range(100000), 3000):
            root = insert(root, k)
        joined = " ".join(f"{w}:{counts.get(w, 0)}" for w in words)
        total += len(re.findall(r"\b[a-c]\w*:\d+", joined)) + depth(root) + len(text) % 97
    print(total)


def nested(depth, rounds):
    if depth == 0:
        return main(rounds)
    return list(map(lambda _: nested(depth - 1, rounds), [0]))


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    nested(int(sys.argv[2]) if len(sys.argv) > 2 else 0, rounds)

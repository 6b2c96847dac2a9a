#!/usr/bin/env python3
"""make_clicks.py - a synthetic click data set for examples/embedding.c,
drawn from a known model.

Every example has FIELDS categorical fields; field f takes one of
CARD[f] values, drawn Zipf-like (a few values are common, most rare, as
in real click logs). The generating model gives every (field, value) a
weight, normal with sd 1, and the click probability of an example is
sigmoid(BIAS + sum of its weights). Each (field, value) is hashed into
[0, vocab) (the hashing trick: a fixed multiplicative hash, collisions
allowed), and the file holds:

  x  float32 [N, FIELDS]  the hashed ids (exact: vocab <= 2^24)
  y  int32   [N]          the clicks (0 or 1)
  attrs: bias, vocab, seed, and the Bayes loss (the mean cross-entropy of
         the true probabilities: no model can do better on average)

  python3 make_clicks.py clicks.h5 [--n 20000] [--vocab 65536] [--seed 1]
"""
import argparse

import h5py
import numpy as np

FIELDS = 8
CARD = [10, 50, 200, 1000, 5000, 20000, 100, 3]
BIAS = -1.5


def hashed(field, value, vocab):
    """Field f's value v -> a row of the table: the same in every run."""
    k = (np.uint64(field + 1) * np.uint64(0x9E3779B97F4A7C15)
         ^ value.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
    k ^= k >> np.uint64(29)
    return (k % np.uint64(vocab)).astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not 1 <= a.vocab <= 1 << 24:
        ap.error("--vocab must be in 1..2^24 (ids are stored as float32)")
    rng = np.random.default_rng(a.seed)
    logit = np.full(a.n, BIAS)
    x = np.zeros((a.n, FIELDS), dtype=np.float32)
    with np.errstate(over="ignore"):
        for f, card in enumerate(CARD):
            weights = rng.normal(0.0, 1.0, card)
            p = 1.0 / np.arange(1, card + 1) ** 1.1
            v = rng.choice(card, size=a.n, p=p / p.sum())
            logit += weights[v]
            x[:, f] = hashed(f, v, a.vocab).astype(np.float32)
    prob = 1.0 / (1.0 + np.exp(-logit))
    y = (rng.random(a.n) < prob).astype(np.int32)
    bayes = -np.mean(y * np.log(prob) + (1 - y) * np.log(1 - prob))
    with h5py.File(a.out, "w") as h:
        h["x"] = x
        h["y"] = y
        h.attrs["bias"] = BIAS
        h.attrs["vocab"] = a.vocab
        h.attrs["seed"] = a.seed
        h.attrs["bayes_loss"] = bayes
    print("%s: %d examples, %d fields, vocab %d, click rate %.3f, "
          "Bayes loss %.4f" % (a.out, a.n, FIELDS, a.vocab, y.mean(), bayes))


if __name__ == "__main__":
    main()

"""Mutation fuzz of checkpoint bytes (zip, legacy, plain pickle, safetensors) through the capped CLI.

Seeds carry a live payload (``os.system("touch ...")``) next to real tensors. 320 deterministic mutations:
byte flips, truncations, insertions, duplicated chunks and "interesting" integers written over length and
offset fields. Every scan must exit 0, 1 or 2, stay within time and memory, and run no code (the child's
audit hook sees no ``os.system`` / ``pickle.find_class``; the canary directory stays empty). For safetensors,
the real ``safe_open`` is the oracle: a mutant is unreadable here (exit 2) exactly when safe_open refuses it.
"""

from __future__ import annotations

import pickle
import random
import struct
from pathlib import Path

import torch

from checkpoint import hostile
from checkpoint.capped import assert_bounded, run_scans

MUTANTS_PER_SEED = 80
_INTERESTING = (0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 10**9, 2**31, 2**63 - 1, 2**64 - 1)


def _seeds(canary_dir: Path) -> dict[str, bytes]:
    evil = hostile.Evil(canary_dir / "pwned")
    state = {"model": {"w": torch.randn(4, 4), "b": torch.zeros(4, dtype=torch.float16)}, "evil": evil,
             "step": 3, "tied": None}
    state["tied"] = state["model"]["w"]
    from safetensors.torch import save as st_save

    return {
        "zip.pt": hostile.torch_zip(state),
        "legacy.pt": hostile.torch_legacy(state),
        "plain.pkl": pickle.dumps({"w": torch.ones(3), "p": torch.nn.Parameter(torch.zeros(2)), "evil": evil}),
        "model.safetensors": st_save({"a.weight": torch.zeros(3, 2), "a.bias": torch.ones(3, dtype=torch.bfloat16)},
                                     metadata={"format": "pt"}),
    }


def _mutate(data: bytes, rng: random.Random) -> bytes:
    raw = bytearray(data)
    for _ in range(1 if rng.random() < 0.7 else 2):
        how = rng.choices(range(5), weights=(6, 1, 2, 1, 3))[0]
        i = rng.randrange(len(raw)) if raw else 0
        if how == 0:
            for _ in range(rng.randint(1, 2)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        elif how == 1:
            del raw[rng.randrange(len(raw) + 1):]
        elif how == 2:
            raw[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif how == 3:
            j = min(len(raw), i + rng.randint(1, 64))
            raw[i:i] = raw[i:j] * rng.randint(1, 4)
        elif len(raw) >= i + 8:
            width, fmt = rng.choice(((4, "<I"), (8, "<Q"), (2, "<H")))
            value = rng.choice(_INTERESTING) % (1 << (8 * width))
            raw[i:i + width] = struct.pack(fmt, value)
        if not raw:
            raw = bytearray(b"\x80")
    return bytes(raw)


def _safe_open_refuses(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            list(f.keys())
    except Exception:
        return True
    return False


def test_mutation_fuzz_of_checkpoint_bytes(tmp_path):
    canary_dir = tmp_path / "canary"
    canary_dir.mkdir()
    rng = random.Random(20261124)
    files: list[Path] = []
    for name, seed in _seeds(canary_dir).items():
        for k in range(MUTANTS_PER_SEED):
            path = tmp_path / f"m{k:03d}-{name}"
            path.write_bytes(_mutate(seed, rng))
            files.append(path)
    runs = run_scans([["scan", str(p)] for p in files], timeout=900)
    codes = {0: 0, 1: 0, 2: 0}
    for path, run in zip(files, runs):
        assert_bounded(run, seconds=30, rss_mb=300)
        codes[run.rc] += 1
        if path.suffix == ".safetensors":  # refused by safe_open <=> unreadable here
            assert (run.rc == 2) == _safe_open_refuses(path), (path.name, run.text)
    assert not any(canary_dir.iterdir())
    assert codes[2] > 50 and codes[0] + codes[1] > 20, codes  # the fuzz reaches both readable and damaged files

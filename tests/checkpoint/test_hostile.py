"""Hostile files through the real CLI, each run under a timeout and an address-space cap (see capped.py).

Every file is built here, at test time. Before the bounded reader: the 12-byte memo bomb peaked at 15.5 GB,
1 kB of nested storage blobs ran for minutes, a zip member declaring 3 GiB took 6.4 GB and said "ok", damaged
zip headers and safetensors numbers gave tracebacks with exit 1, and 11 files safe_open refuses were "ok".
"""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from checkpoint import hostile  # tests/ is on sys.path; tests/checkpoint is a namespace package
from checkpoint.capped import assert_bounded, run_scans


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bombs")
    files = {
        "memo-long-binput.pkl": hostile.memo_bomb(),
        "memo-put.pkl": hostile.memo_bomb("PUT"),
        "nested-blobs.pkl": hostile.nested_bomb(depth=6, fanout=8),
        "wide-blobs.pkl": hostile.wide_blob_bomb(fanout=100_000),
        "legacy-memo.pt": hostile.memo_bomb() + b"rest of a legacy stream",
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # the memo bomb as the data.pkl of a torch.save zip
        z.writestr("archive/data.pkl", hostile.memo_bomb())
    files["zip-memo.pt"] = buf.getvalue()
    for name, data in files.items():
        (d / name).write_bytes(data)
    hostile.zip_declaring(d / "zip-byteorder-3gib.pt")
    hostile.zip_declaring(d / "zip-datapkl-3gib.pt", member="data.pkl")
    return {p.name: p for p in d.iterdir()}


def test_bombs_are_refused_fast_and_small(bombs):
    assert len(hostile.memo_bomb()) == 12 and len(hostile.nested_bomb(6, 8)) < 1500
    assert os.path.getsize(bombs["zip-byteorder-3gib.pt"]) > 3 * 1024**3  # apparent size: a sparse hole
    runs = {Path(r.argv[1]).name: r for r in run_scans([["scan", str(p)] for p in bombs.values()])}
    for name, run in runs.items():
        assert_bounded(run, seconds=20, rss_mb=200)
        if name == "wide-blobs.pkl":  # the same blob 100,000 times through the memo is one storage, read once:
            assert run.rc == 2 and "holds no tensors" in run.err, run  # read to the end, and it holds no tensor
            continue
        assert run.rc == 2, run
        assert f"torchdoctor scan: {name}: " in run.err, run.err
    assert "memo index 1000000000" in runs["memo-long-binput.pkl"].err
    assert "memo index 1000000000" in runs["memo-put.pkl"].err
    assert "memo index 1000000000" in runs["zip-memo.pt"].err
    assert "nested more than 2 deep" in runs["nested-blobs.pkl"].err
    assert "archive/byteorder declares 3,221,225,472 bytes" in runs["zip-byteorder-3gib.pt"].err
    assert "archive/data.pkl declares 3,221,225,472 bytes" in runs["zip-datapkl-3gib.pt"].err


def test_damaged_zip_headers_and_legacy_key_list(tmp_path):
    state = {"w": torch.zeros(2)}
    cases = {
        "encrypted.pt": (hostile.zip_patched(state, "flags", 1), "archive/data.pkl is encrypted"),
        "method-99.pt": (hostile.zip_patched(state, "method", 99), "compression method 99"),
        "version-99.pt": (hostile.zip_patched(state, "version", 99), "zip file version 9.9"),
        "legacy-missing-key.pt": (hostile.legacy_missing_key(), "storage key list does not match"),
        "directory-1gib.pt": (hostile.zip_directory_claiming(), "refused: a zip directory of 1,073,741,824 bytes"),
    }
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    for name in ("encrypted.pt", "method-99.pt"):  # the real loader refuses them too
        with pytest.raises(Exception):
            torch.load(tmp_path / name, weights_only=True)
    runs = run_scans([["scan", str(tmp_path / n)] for n in cases])
    for run, (name, (_, fragment)) in zip(runs, cases.items()):
        assert_bounded(run)
        assert run.rc == 2 and fragment in run.err, run


def _safe_open_refuses(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            list(f.keys())
    except Exception:
        return True
    return False


def test_safetensors_refused_by_safe_open_are_never_ok(tmp_path):
    names = []
    for name, data in hostile.safetensors_refused().items():
        (tmp_path / f"{name}.safetensors").write_bytes(data)
        names.append(f"{name}.safetensors")
    hostile.big_header_safetensors(tmp_path / "header-100000001.safetensors")
    names.append("header-100000001.safetensors")
    assert len(names) >= 11
    for name in names:
        assert _safe_open_refuses(tmp_path / name), name  # the oracle: the real library refuses each one
    runs = run_scans([["scan", str(tmp_path / n)] for n in names])
    for run in runs:
        assert_bounded(run)
        assert run.rc == 2 and "safe_open" in run.err, run
    by_name = {Path(r.argv[1]).name: r.err for r in runs}
    assert "overlaps another tensor" in by_name["overlapping-offsets.safetensors"]
    assert "leaves a gap before it" in by_name["gapped-offsets.safetensors"]
    assert "1e400 out of range" in by_name["shape-1e400.safetensors"]
    assert "more than the 100,000,000 safe_open accepts" in by_name["header-100000001.safetensors"]


def test_safetensors_that_safe_open_accepts_are_read(tmp_path):
    """The other direction: strictness stops where the library's does."""
    eight = bytes(8)
    t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    cases = {
        "metadata-null": hostile.safetensors_bytes({"__metadata__": None, "a": t}, eight),
        "extra-field": hostile.safetensors_bytes({"a": {**t, "note": [1, 2]}}, eight),
        "leading-space": hostile.safetensors_bytes(raw=b" " + json.dumps({"a": t}).encode(), data=eight),
        "duplicate-key": hostile.safetensors_bytes(raw=b'{"a":%s,"a":%s}' % ((json.dumps(t).encode(),) * 2), data=eight),
        "empty": hostile.safetensors_bytes({}),
        "zero-size": hostile.safetensors_bytes({"a": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}}),
        "f6-packed": hostile.safetensors_bytes({"a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}},
                                               bytes(3)),
    }
    for name, data in cases.items():
        (tmp_path / f"{name}.safetensors").write_bytes(data)
        assert not _safe_open_refuses(tmp_path / f"{name}.safetensors"), name
    for run in run_scans([["scan", str(tmp_path / f"{n}.safetensors")] for n in cases]):
        assert_bounded(run)
        if run.argv[1].endswith("empty.safetensors"):  # read, and nothing in it to check: as for an object
            assert run.rc == 2 and "holds no tensors (a safetensors file)" in run.err, run
            continue
        assert run.rc == 0 and "ok: no problems found" in run.out, run


def test_keys_with_terminal_escapes_are_printed_escaped(tmp_path):
    marker = tmp_path / "PWNED"
    hide = "\r\x1b[2K\x1b[8m"
    torch.save({f"{hide}model.w": torch.zeros(2), hide: hostile.Evil(marker)}, tmp_path / "escapes.pt")
    from safetensors.torch import save_file

    save_file({f"a{hide}": torch.zeros(1)}, str(tmp_path / "escapes.safetensors"))
    text, as_json, st = run_scans([["scan", str(tmp_path / "escapes.pt")],
                                   ["scan", str(tmp_path / "escapes.pt"), "--json"],
                                   ["scan", str(tmp_path / "escapes.safetensors"), "--dtype", "float16"]])
    assert not marker.exists()
    for run in (text, st):
        assert_bounded(run)
        assert "\x1b" not in run.out and "\r" not in run.out, run.out
    (line,) = [ln for ln in text.out.splitlines() if "pickle global posix.system" in ln]
    assert line.split()[:2] == ["unsafe_global", "\\r\\x1b[2K\\x1b[8m"] and "do not load this file" in line
    assert "a\\r\\x1b[2K\\x1b[8m" in st.out
    doc = json.loads(as_json.out)  # JSON keeps the real key (its encoder escapes it)
    assert {p["path"] for p in doc["problems"]} == {hide} and f"{hide}model.w" in {t["path"] for t in doc["tensors"]}


def test_directory_scan_reports_every_entry(tmp_path):
    root, outside = tmp_path / "ckpt", tmp_path / "elsewhere"
    for d in (root, root / "locked_dir", outside):
        d.mkdir()
    torch.save({"w": torch.zeros(2)}, root / "good.pt")
    torch.save({"w": torch.zeros(2)}, root / "locked.pt")
    torch.save({"w": torch.zeros(2)}, root / "locked_dir" / "inner.pt")
    from safetensors.torch import save_file

    save_file({"v": torch.zeros(3)}, str(outside / "linked.safetensors"))
    (root / "linked_dir").symlink_to(outside, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)
    (root / "gone.safetensors").symlink_to(tmp_path / "missing.safetensors")
    os.mkfifo(root / "model.bin")
    (root / "locked.pt").chmod(0)
    (root / "locked_dir").chmod(0)
    try:
        text, as_json = run_scans([["scan", str(root)], ["scan", str(root), "--json"]], honour_permissions=True)
    finally:
        (root / "locked_dir").chmod(0o755)
    for run in (text, as_json):
        assert_bounded(run)
        assert run.rc == 2, run  # the worst of: clean files (0) and entries that could not be read (2)
    doc = json.loads(as_json.out)
    reasons = {p["path"]: p["found"] for p in doc["problems"] if p["kind"] == "unreadable"}
    assert set(reasons) == {"locked.pt", "locked_dir", "loop", "gone.safetensors", "model.bin"}, reasons
    assert "Permission denied" in reasons["locked.pt"] and "unreadable directory" in reasons["locked_dir"]
    assert reasons["model.bin"].startswith("a FIFO (named pipe)")
    assert "dangling symlink" in reasons["gone.safetensors"] and "already scanned" in reasons["loop"]
    assert {t["path"] for t in doc["tensors"]} == {"good.pt/w", "linked_dir/v"}  # the others still checked
    assert "a FIFO (named pipe), not a checkpoint file" in text.out and "locked.pt" in text.out


def test_special_files_as_the_target(tmp_path):
    os.mkfifo(tmp_path / "pipe.pt")
    (run,) = run_scans([["scan", str(tmp_path / "pipe.pt")]], timeout=120)  # never blocks on the FIFO
    assert_bounded(run)
    assert run.rc == 2 and "pipe.pt: a FIFO (named pipe), not a checkpoint file" in run.err, run
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe.pt").st_mode)


def test_public_scan_of_a_directory_with_bad_entries(tmp_path):
    import torchdoctor

    torch.save({"w": torch.zeros(2)}, tmp_path / "a.pt")
    (tmp_path / "b.pt").write_bytes(hostile.memo_bomb())
    os.mkfifo(tmp_path / "c.safetensors")
    report = torchdoctor.scan(str(tmp_path))
    assert [t.path for t in report.tensors] == ["a.pt/w"]
    bad = {p.path: p.message for p in report.problems if p.kind == "unreadable"}
    assert set(bad) == {"b.pt", "c.safetensors"} and "memo index" in bad["b.pt"]
    assert "the rest of the directory was checked without it" in bad["c.safetensors"]
    skipped = {s["path"]: s["reason"] for s in report.extra["skipped"]}
    assert skipped["c.safetensors"] == "a FIFO (named pipe), not a checkpoint file: not read"
    assert skipped["b.pt"].startswith("refused: pickle memo index 1000000000")


def test_restricted_unpickler_stays_bounded_on_hash_floods(tmp_path):
    """A dict of 20,000 ints sharing one hash takes seconds (quadratic) in the C unpickler: refused first."""
    big = (1 << 61) - 1
    body = b"".join(pickle.dumps(i * big, protocol=2)[2:-1] + b"K\x00" for i in range(1, 5001))
    (tmp_path / "flood.pkl").write_bytes(b"\x80\x02}(" + body + b"u.")
    (run,) = run_scans([["scan", str(tmp_path / "flood.pkl")]])
    assert_bounded(run, seconds=10)
    assert run.rc == 2 and "share one hash value" in run.err

"""``torchdoctor env``: the environment doctor (``--facts FILE`` diagnoses another machine offline)."""

from __future__ import annotations

import json
import sys
from typing import Any

from torchdoctor._report.text import EXIT_OK, EXIT_PROBLEMS
from torchdoctor._cli.common import UsageError, print_json
from torchdoctor._env.facts import FACTS_SCHEMA
from torchdoctor._env.report import env_report


def load_facts(path: str) -> dict[str, Any]:
    """Read ``torchdoctor env --json`` output (or its ``facts`` part); a ``UsageError`` with one line otherwise."""
    try:
        if path == "-":
            doc = json.load(sys.stdin)
        else:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read facts file {path!r}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"facts file {path!r} is not valid JSON: {exc}") from exc
    is_env = isinstance(doc, dict) and str(doc.get("schema", "")).startswith("torchdoctor/env/")
    is_env = is_env and isinstance(doc.get("facts"), dict)
    is_facts = isinstance(doc, dict) and (doc.get("schema") == FACTS_SCHEMA or isinstance(doc.get("torch"), dict))
    if not (is_env or is_facts):
        raise UsageError(
            f"{path!r} is not torchdoctor env JSON (expected the output of `torchdoctor env --json` or its \"facts\" part)")
    return doc


def command(args: Any) -> int:
    if args.facts and args.probe:
        raise UsageError("--probe asks this machine's devices; it cannot be combined with --facts")
    if getattr(args, "markdown", False) and args.json:
        raise UsageError("--markdown and --json are two forms of the same report: choose one")
    report = env_report(load_facts(args.facts) if args.facts else None, probe=bool(args.probe))
    if getattr(args, "markdown", False):
        print(report.markdown())
    elif args.json:
        print_json(report.to_dict())
    else:
        print(report.text())
    return EXIT_OK if report.ok else EXIT_PROBLEMS

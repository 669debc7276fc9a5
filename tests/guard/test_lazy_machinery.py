"""guard loads its error machinery (rules, report types, culprit, maker, remedy) only when something fails (issue 43
point 4): a watched program that raises nothing pays for none of it, and the first error still gets it all."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("torchdoctor._guard.notes", "torchdoctor._guard.remedy", "torchdoctor._guard.maker",
         "torchdoctor._guard.provenance", "torchdoctor._guard.maps", "torchdoctor._rules.registry",
         "torchdoctor._report.model", "torchdoctor._placement")

CODE = """
import json, sys, torch, torchdoctor
heavy = {heavy!r}
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
with torchdoctor.guard(m, mode={mode!r}):
    m(torch.ones(2, 4))
quiet = [h for h in heavy if h in sys.modules]
m[2].bias.data = m[2].bias.data.double()
try:
    with torchdoctor.guard(m, mode={mode!r}):
        m(torch.ones(2, 4))
    said = ""
except Exception as e:
    said = str(e)
print(json.dumps({{"quiet": quiet, "said": said}}))
"""


def _run(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath("src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", CODE.format(heavy=HEAVY, mode=mode)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_explain_loads_nothing_until_an_error_and_then_explains_it() -> None:
    got = _run("explain")
    assert got["quiet"] == []
    assert "2.bias" in got["said"] and "float64" in got["said"] and "Fix:" in got["said"], got["said"]


def test_strict_loads_the_rules_but_no_culprit_machinery_until_a_problem() -> None:
    got = _run("strict")
    assert [h for h in got["quiet"] if "_guard" in h] == []  # the rules (and the types they use) are its checks
    assert "2.bias" in got["said"] and "float64" in got["said"], got["said"]

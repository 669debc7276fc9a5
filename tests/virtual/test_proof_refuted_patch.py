"""A line fix whose virtual re-run still finds a problem at the very line it changes is refuted: its diff is never
offered as a patch (text or JSON), while the headline says what the re-run found. A re-run that finds the problem
elsewhere, or a proven fix, keeps its diff. (The case that first showed it, ``torch.ones(8).cuda()`` on a cuda:1 run,
is now fixed at the move itself: ``test_maker_moved_line``.)"""

from __future__ import annotations

from torchdoctor._virtual.prove import Fix, patch_of, refuted

DIFF = """--- a/app.py
+++ b/app.py
@@ -5,3 +5,3 @@
     def forward(self, x):
-        bias = torch.ones(8).cuda()
+        bias = torch.ones(8, device=x.device).cuda()
         return self.lin(x) + bias
"""


def _fix(tried: str, proven: bool = False) -> Fix:
    return Fix("bias = torch.ones(8, device=x.device).cuda()", "note", diff=DIFF, proven=proven, tried=tried)


def test_a_fix_still_failing_at_its_own_line_is_refuted_and_never_patched() -> None:
    fix = _fix("at the failing op; but a virtual re-run with it applied still found: a tensor made by torch.ones in "
               "`<root>` at app.py:6 f32[8]@cuda:0 is on cuda:0")
    assert refuted(fix) and patch_of([fix]) == []


def test_a_fix_whose_rerun_fails_elsewhere_or_that_is_proven_keeps_its_diff() -> None:
    elsewhere = _fix("but a virtual re-run with it applied still found: a tensor made by torch.zeros at app.py:9")
    proven = _fix("at the failing op: no problem", proven=True)
    assert not refuted(elsewhere) and not refuted(proven)
    assert patch_of([proven]) == [DIFF]

"""Issue 41 point 7, session 27: the nineteenth collection, drawn as the eighteenth was, from other plain queries (100
real texts of 100 threads, labelled and frozen before explain ran on any of them; twelve are no device or dtype error).

How the texts were drawn: the GitHub issue threads the ``search`` tool returns (corpus "issues", twelve results a
query, best first) for this fixed list of plain queries, none of them the eighteenth's, in this order:

  q1 Expected all tensors to be on the same device lightning; q2 ... accelerate; q3 ... deepspeed; q4 ... vllm; q5 ...
  sentence-transformers; q6 ... ultralytics; q7 ... whisper; q8 ... stable-baselines3; q9 ... torchaudio; q10 ...
  torch_geometric; q11 CUDA error: no kernel image; q12 Torch not compiled with CUDA enabled; q13 found no NVIDIA
  driver docker; q14 cuda is not available; q15 torch.cuda.is_available() returns False; q16 xpu error pytorch; q17
  ipex error intel extension for pytorch; q18 mps backend error (no PyTorch thread came back; run again once as "mps
  backend pytorch error"); q19 MPS does not support (feature requests only; run again once as "Cannot convert a MPS
  Tensor to float64 dtype as the MPS framework doesn't support float64": every result already held); q20 Half
  precision error RuntimeError; q21 BFloat16 not supported error; q22 float8 error torch; q23 expected Double but
  found Float error (no PyTorch thread; run again once as "Found dtype Double but expected Float"); q24 expected Long
  tensor error; q25 map_location torch.load error. For the texts of no such family: u1 Error(s) in loading state_dict
  size mismatch; u2 element 0 of tensors does not require grad and does not have a grad_fn; u3 DataLoader worker
  exited unexpectedly.

The order rule: for each query in turn, the first four results in rank order are taken (four, not all, so that 25
themes share the ~88 places rather than the first few device queries filling them), except a thread some collection
already holds (its ``# source:`` line in fixtures/, holdout/ or unrelated/), one an earlier query took, and a text that
is no error (a feature request, a pull request that names no error, a thread whose shown text holds no message and no
cause to file it by, an error of a program that does not run PyTorch, or, for q1-q25, an error of no device or dtype
family). The list stopped when 88 device / dtype texts were taken (at q25's first). From u1-u3 the first four of each
are taken, category "none". The text is the thread's title, then its first post and replies as the search shows them
(author and date lines left out; a long environment dump or traceback cut after its first lines). Each file's
``# query:`` line names the query that found it.
"""

from __future__ import annotations

import pathlib
from support.holdout import collection as _collection, frozen_and_split

HERE = pathlib.Path(__file__).parent
# sha256 of the collection's sorted "source|category" lines, taken before explain ran on any of its texts
FROZEN = "f89cac2ce6c28e425bc38f8d4ca16d4dd289da195143f8fb65984e22ed32098c"


COLLECTION = _collection("19")


def test_labels_frozen_and_split_by_the_fixed_rule() -> None:
    """The labels are those frozen before explain ran; a device or dtype text is held out when the sha256 of its
    source line starts below "33" (the third collection's rule); the texts of no such family live in unrelated/."""
    frozen_and_split(COLLECTION, 100, FROZEN)
    assert sum(p.parent.name == "holdout" for p, _, _ in COLLECTION) == 13

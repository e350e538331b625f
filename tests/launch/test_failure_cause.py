"""The exception that ended a worker, read back from its log."""

from __future__ import annotations

from tidal.launch.failure_cause import last_error_line, last_exception

TRACEBACK = """\
step 3 loss 0.25
Traceback (most recent call last):
  File "/job/train.py", line 9, in <module>
    optimizer = make_optimizer(model)
                ^^^^^^^^^^^^^^^^^^^^^
  File "/job/train.py", line 4, in make_optimizer
    raise ValueError("lr must be positive, got -0.1")
ValueError: lr must be positive, got -0.1
"""


def test_the_exception_line_of_a_traceback() -> None:
    assert last_exception(TRACEBACK) == "ValueError: lr must be positive, got -0.1"


def test_the_last_of_chained_tracebacks_and_a_dotted_name() -> None:
    chained = (
        TRACEBACK
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + "Traceback (most recent call last):\n"
        + '  File "/job/train.py", line 12, in <module>\n'
        + "    torch.cuda.synchronize()\n"
        + "torch.OutOfMemoryError: CUDA out of memory\n"
        + "later output\n"
    )
    assert last_exception(chained) == "torch.OutOfMemoryError: CUDA out of memory"
    assert last_exception("Traceback (most recent call last):\n  x\nKeyboardInterrupt\n") == (
        "KeyboardInterrupt"
    )


def test_no_guess_without_a_whole_traceback() -> None:
    assert last_exception("Error: something went wrong\n") is None
    cut = 'Traceback (most recent call last):\n  File "/job/train.py", line 9\n'
    assert last_exception(cut) is None
    interleaved = "Traceback (most recent call last):\n  File 'x'\n[rank 1] step 4 done\n"
    assert last_exception(interleaved) is None


def test_a_long_message_is_cut() -> None:
    line = "RuntimeError: " + "x" * 1000
    cause = last_exception(f"Traceback (most recent call last):\n  f\n{line}\n")
    assert cause is not None and len(cause) == 300 and cause.endswith("…")


def test_a_program_that_found_no_file_says_so_without_a_traceback() -> None:
    missing = (
        "python: can't open file '/job/does_not_exist.py': [Errno 2] No such file or directory"
    )
    assert last_error_line(f"starting\n{missing}\n\n") == missing
    assert last_error_line("sh: 1: trian.sh: not found\n") == "sh: 1: trian.sh: not found"
    # Only the last line, and only a not-found one: nothing else is taken for a cause.
    assert last_error_line(f"{missing}\nstep 4 loss 0.2\n") is None
    assert last_error_line("Error: something went wrong\n") is None
    assert last_error_line("") is None

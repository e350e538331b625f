"""Runnable examples, each a script (``python examples/<name>.py``); a package too, so that
the tests can import their helpers (``examples.ps_digits``) and mypy names each file once."""

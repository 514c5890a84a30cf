"""Coverage-guided fuzzing (atheris) of everything that parses untrusted bytes.

One target per file (``target_<name>.py``), each a ``test_one_input(data)``
that feeds the bytes to one parser and treats any exception other than the
parser's documented ones as a crash; ``harness.py`` runs them under libFuzzer
with a 5 s hang limit. ``test_fuzz.py`` gives every target a few seconds in CI;
``python -m tests.fuzz TARGET --seconds 600`` is the long run.
"""

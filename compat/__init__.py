"""One module per dependency whose private internals the project touches (S-DEP-2).

Each names the versions its internals were written against and falls back to the
dependency's public API outside them; tests/in_process/test_compat.py fails when an
internal is gone from the installed version, and tests/pure/test_private_internals.py
when one is used outside this package."""

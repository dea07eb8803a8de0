"""Profiles for tests that name their own callables (`tests.…:fn`) in overrides: the
operator's file is the only place `job.trusted_modules` can be set (S-SEC-3)."""

"""Which roles share which devices, decided once per run (S-RUN-4, S-RUN-5).

`placement.plan` is pure (no Ray, no torch at import): `--validate-manifest` checks a
GPU launch on a laptop with it. `placement.ray_lowering` turns a plan into Ray
placement groups and actor options."""

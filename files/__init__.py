"""Plain files every room shares, below all of them but compat/: durable writes
(`durable.py`, S-CKPT-9), a file's size and sha256 (`digest.py`), and a Hugging Face
model folder read from its files alone (`model_folder.py`). Nothing here imports
another room of the project."""

"""The pipeline: its actors, its supervisor tree (tree.py) and its runner."""

"""One run of one (framework, seed): trained in one place (train.py), and run again from its record (reproduce.py)."""

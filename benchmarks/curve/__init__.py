"""The parts of benchmarks/learning_curve.py (the pipeline and its command stay there)."""

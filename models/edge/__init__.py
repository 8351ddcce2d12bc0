"""The edge side of the models: what an edge agent loads and runs next to the machine.

Tokenizer, ONNX runtime scorer, baselines that score without training, calibration maps, explanations, and the checks
on what it loads (signatures, manifests, releases, registries). numpy, onnxruntime and cryptography only: nothing here
imports torch, transformers or scikit-learn at module level (``tests/test_edge_no_torch.py`` runs an edge process that
refuses them), and nothing here imports :mod:`models.training`.
"""

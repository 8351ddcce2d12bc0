"""Models that score a machine's window: baselines, the telemetry language model, its export and the edge runtime.

Training code (torch) lives apart from inference code (onnxruntime, numpy) so the edge install stays small.
"""

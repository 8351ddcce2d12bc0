"""The training side of the models: cutting labeled windows, training the telemetry language model (torch), exporting
and quantizing it to a signed ONNX artifact, and evaluating it against the baselines.

Runs in the cloud (the ``cloud`` extra). It builds on :mod:`models.edge` (the tokenizer and runtime it exports for),
never the other way round.
"""

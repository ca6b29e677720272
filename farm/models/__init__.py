"""Model tooling, apart from the ledger: everything farm knows about a model file.

- ``info``: detect a file's format, hash it, infer or check its input spec (``inspect_model``)
- ``torchscript``: TorchScript loading, declared inputs and example modules (torch imported lazily)
- ``examples``: seeded example models for tests, demos and benchmarks (``build_example``)
- ``architectures`` / ``torch_architectures``: real architectures (BERT-style encoder, ResNet-18) as ONNX
  graphs built from code and as PyTorch modules with the same weights
- ``analysis``: static metrics per sample: params, MACs, FLOPs, activation bytes (``analyze``)
- ``onnx_counter`` / ``torch_counter``: the per-op counters behind ``analysis``
"""

"""fragscope's Python package (docs/python.md).

* ``fragscope.torch``: the Monitor (OOM risk inside a PyTorch training loop, checkpoint and
  restart with the fix: docs/live-monitoring.md), its Lightning and Hugging Face callbacks
  (``fragscope.torch.monitor_adapters``), and a virtual GPU for real PyTorch on the CPU
  (docs/virtual-gpu.md). Imports torch.
* ``fragscope.jax``: the same Monitor for JAX (``Device.memory_stats()``). Imports jax.
* ``fragscope.keras``: the same Monitor for TensorFlow and its Keras callback,
  ``MonitorCallback``. Imports tensorflow and keras.
* ``fragscope.alloc_conf``: PyTorch's allocator-settings variable as each torch version reads it.
* ``fragscope.agent``: the agent that sends a process's allocator figures to ``fragscope serve``.
* ``fragscope._core``: the native core (settings grammar, simulator, forecaster), loaded through
  ``fragscope._native.load()``; it links no framework.

The ``fragscope`` command comes with the package (``pip install .``). Importing ``fragscope``
itself imports nothing else.
"""
__version__ = "0.1.0"

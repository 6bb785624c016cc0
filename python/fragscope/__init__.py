"""fragscope's Python package.

* ``fragscope.torch``: a virtual GPU for real PyTorch on the CPU -- the process's own
  allocations go, live, through fragscope's model of PyTorch's CUDA caching allocator
  (docs/virtual-gpu.md).  Needs torch and the native module (``make demo`` builds it).
* ``fragscope.agent``: the agent that sends a training process's allocator figures to
  ``fragscope serve`` (the same module as ``python/fragscope_agent.py``).

Importing ``fragscope`` itself imports nothing else.
"""

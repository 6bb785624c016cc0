"""``fragscope.agent`` is ``fragscope_agent`` (python/fragscope_agent.py) under the package's name:
the same module object, so either import sees the same state."""
import sys

import fragscope_agent as _agent

sys.modules[__name__] = _agent

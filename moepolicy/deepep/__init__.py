"""What moepolicy knows about DeepEP, in one place: the installed build (``probe``), buffer sizes
from chunk configs (``buffers``), chunk configs and DeepEP's built-in defaults (``configs``), and the
settings engines run DeepEP with (``engines``). Light: no torch, no deep_ep import at module level."""

"""Binary size units, defined once for the whole library.

Every size in s3stream is counted in bytes with 1024-based (IEC) units: ``KiB`` = 1024,
``MiB`` = 1024², ``GiB`` = 1024³, ``TiB`` = 1024⁴. They live here, in a module that imports
nothing, so that any module (settings, caches, the compactor, the Spark source) can use the
same constants without an import cycle. The text form of sizes (``"64MiB"``) is parsed by
`s3stream.settings_parse.parse_size`, which accepts these units only.
"""

from __future__ import annotations

__all__ = ["SIZE_UNITS", "GiB", "KiB", "MiB", "TiB"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

#: The units a size may be written with, by their (case-insensitive) suffix.
SIZE_UNITS = {"KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}

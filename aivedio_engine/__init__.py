"""aivedio engine: the domain core, persistence, services and process roles.

Importing this package has no side effects; the version is the only thing defined here.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aivedio")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

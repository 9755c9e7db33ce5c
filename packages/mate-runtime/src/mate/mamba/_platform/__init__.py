"""The platform under every layer: the device facts (device.py), the settings (settings.py) and the version
(version.py). Imports nothing of MATE above it."""

"""A stand-in for Intel's habana_frameworks package, for tests on machines without a Gaudi.

Put tests/support/fake_habana on PYTHONPATH and tests/support/fake_habana/bin on PATH: the host
probe then reads habana-torch-plugin 1.21.0.555 from the dist-info beside this package and an
HL-325L (Gaudi3) from the hl-smi stand-in ($FAKE_HABANA_PRODUCT picks another product).
Nothing here talks to a device.
"""

"""Built-in harness plugins, one `HarnessSpec` per module, registered in setup.cfg under the
entry-point group `harness_gym.harnesses` (installed as the package `harness_gym.harnesses`)."""

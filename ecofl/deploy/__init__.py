"""Real deployment of a home: long-lived device daemons and the home service beside the Flower SuperNode.

- :mod:`.device_daemon`: ``ecofl device serve`` on every device; joins its
  home's service with the home's secret, describes itself, beats, and runs a
  pipeline worker whenever the service asks, round after round;
- :mod:`.home_service`: ``ecofl home serve`` on the portal machine; the
  registry of the devices present, plans each round on them and runs the
  pipeline for the home's Flower ClientApp;
- :mod:`.home_client`: what the ClientApp calls to train at its home service;
- :mod:`.home_status`: `ecofl home status`, a light query of a running service;
- :mod:`.device_profile`: how a device measures its speed and memory;
- :mod:`.secrets`: reading the home's secret from a file or the environment.

docs/deploy.md walks through a deployment on real devices.
"""

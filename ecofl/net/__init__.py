"""The network layer of a home: authenticated, sealed channels between its devices and typed messages on them."""

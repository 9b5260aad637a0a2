"""Hydra-configured Flower simulations of Eco-FL (``python -m simulations.run``) and their plots."""

"""Flower ClientApp of Eco-FL: a home's portal node (``client.client_app:app``)."""

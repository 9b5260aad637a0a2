"""Flower ServerApp of Eco-FL: the event loop over Grid push/pull (``server.server_app:app``)."""

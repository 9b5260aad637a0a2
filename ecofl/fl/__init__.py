"""Grouping-based hierarchical aggregation (Eco-FL §5): groups, aggregation, clocks, the event loop."""

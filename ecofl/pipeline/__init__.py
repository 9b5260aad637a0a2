"""The in-home pipeline: profiles, schedules, cost model, planners, runtime."""

"""The controller loop: each tick observes what the backend reports, asks the policy, and
applies its answer."""

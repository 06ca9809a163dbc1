"""The box's database backends: Django's own, with what the box needs on top."""

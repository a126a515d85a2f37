"""A Django app that captions and translates images through a Compass-planned job."""

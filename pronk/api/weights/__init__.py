"""`/v1/weights`: register checkpoints as model versions and Leap running fleets to them (admin keys). `routes` (the
router), `wire` (its request and response bodies) and `serving` (allowed sources, upload, Leaps, fleets)."""

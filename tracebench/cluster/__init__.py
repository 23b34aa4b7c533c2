"""The door to Ray (`--ray ADDRESS`, the optional extra `tracebench[ray]`; docs/ray.md): connect.py connects this
process and says, in one line, when Ray is not installed; remote.py holds what the replay's actors share (a remote
clock's offset, a lost actor in words). Low in the house, so that what runs on the cluster imports it
from above: the replay's servers as Ray actors (replay/ray_fleet.py), a sweep's points as Ray tasks
(sweep/ray_points.py). Those three modules alone import ray, only inside the functions a --ray run calls."""

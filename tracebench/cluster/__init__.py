"""Beyond one host, on a Ray cluster (`--ray ADDRESS`, the optional extra `tracebench[ray]`; docs/ray.md): the
servers of a replay as Ray actors (fleet.py), the points of a sweep as Ray tasks (sweep.py). Nothing outside this
package imports ray, and these modules import it only inside the functions a --ray run calls (connect.py)."""

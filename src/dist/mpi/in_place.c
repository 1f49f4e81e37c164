/* src/dist/mpi/in_place.c: the MPI constants that the Rust bindings lack.
 * MPI_IN_PLACE and MPI_MODE_NOCHECK are macros whose values differ between
 * MPI libraries (MPI_IN_PLACE is 1 in Open MPI, -1 in MPICH), so we ask the
 * library's own header for them instead of copying numbers. Compiled by
 * build.rs with mpicc when the `mpi` feature is on; used by
 * src/dist/mpi/ffi.rs (in-place all-reduces) and src/dist/mpi/ffi/window.rs
 * (the shared-memory window's lock_all). */
#include <mpi.h>

void *ddp_mpi_in_place(void) { return MPI_IN_PLACE; }

int ddp_mpi_mode_nocheck(void) { return MPI_MODE_NOCHECK; }

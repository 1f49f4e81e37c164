/* src/dist/mpi/in_place.c: the one MPI constant that the Rust bindings lack.
 * MPI_IN_PLACE is a macro whose value differs between MPI libraries (1 in
 * Open MPI, -1 in MPICH), so we ask the library's own header for it instead
 * of copying a number. Compiled by build.rs with mpicc when the `mpi`
 * feature is on; used by src/dist/mpi/ffi.rs for in-place all-reduces. */
#include <mpi.h>

void *ddp_mpi_in_place(void) { return MPI_IN_PLACE; }

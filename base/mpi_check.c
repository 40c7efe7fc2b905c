/* MPI error translation for the check macros: MPI's text, the call and where it was made. */
#include "base/mpi_check.h"

void dear_log_mpi_error(const char *call, int mpi_rc, const char *file, int line)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS)
        strcpy(text, "unknown MPI error");
    DEAR_ERROR("mpi", "%s failed: %s (code %d, %s:%d)", call, text, mpi_rc, file, line);
}

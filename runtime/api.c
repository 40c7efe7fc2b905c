/* placeholder until the runtime lands */
#include "include/dear.h"

/* annotation.c — placeholder until the scheduler lands. */
#include "internal.h"

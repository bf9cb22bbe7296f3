// Status and Result are part of the public API: they live in include/kiln/status.h, which this forwards to.
#pragma once

#include "kiln/status.h"  // IWYU pragma: export

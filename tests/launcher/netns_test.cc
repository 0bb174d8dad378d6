// Multi-node tessel-run jobs with network namespaces as nodes (filled in below).
#include <gtest/gtest.h>

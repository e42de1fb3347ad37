#include <gtest/gtest.h>
#include "core/dtype.h"
TEST(dtype, bf16_roundtrip) { EXPECT_EQ(ds41rt::round_bf16(1.0f), 1.0f); }

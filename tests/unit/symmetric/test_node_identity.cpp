// Which node a process is on, as NCCL tells nodes apart.

#include <symmpool/node_identity.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace symmpool::test {

// Like NCCL's host hash: hostname and boot id, or SYMMPOOL_HOST_ID.
TEST(NodeIdentity, IsHostnameAndBootIdUnlessOverridden) {
  const std::string id = node_identity("");
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(id.rfind(std::string(host) + "/", 0), 0u) << id;
  EXPECT_GT(id.size(), std::strlen(host) + 1) << "no boot id in " << id;
  EXPECT_EQ(id.find_first_of(" \t\n"), std::string::npos) << id;
  EXPECT_EQ(node_identity(""), id);  // stable
  EXPECT_EQ(node_identity("rack 3\tnode"), "rack_3_node");
  ::setenv("SYMMPOOL_HOST_ID", "rack4", 1);
  EXPECT_EQ(node_identity(), "rack4") << "read from SYMMPOOL_HOST_ID by default";
  ::unsetenv("SYMMPOOL_HOST_ID");
}

}  // namespace symmpool::test

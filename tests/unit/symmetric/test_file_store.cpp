// FileStore on a shared machine: its directory must be private, and no key,
// planted symlink or oversized file gets it to touch anything outside.

#include <symmpool/error.hpp>
#include <symmpool/store.hpp>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

namespace symmpool {

namespace {

constexpr std::chrono::milliseconds kShort{10};

void write_file(const std::string& path, const std::string& content) { std::ofstream(path) << content; }

std::string read_file(const std::string& path) {
  std::stringstream out;
  out << std::ifstream(path).rdbuf();
  return out.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Expects `f` to throw symmpool::logic_error whose message contains each of `parts`.
template <typename F>
void expect_refused(F f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "not refused";
  } catch (const logic_error& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(FileStore, SetGetEraseRoundTrip) {
  TempStoreDir dir;
  FileStore store(dir.path());
  store.set("a/b", std::string("x\0y", 3));
  EXPECT_EQ(store.get("a/b", kShort), std::string("x\0y", 3));
  store.set("a/b", "again");
  EXPECT_EQ(store.get("a/b", kShort), "again");
  store.set("empty", "");
  EXPECT_EQ(store.get("empty", kShort), "");
  store.erase("a/b");
  EXPECT_THROW(store.get("a/b", kShort), timeout_error);
  store.erase("never-set");  // erasing a missing key is fine
  EXPECT_FALSE(exists(dir.path() + "/a%b"));
}

TEST(FileStore, GetTimesOutNamingTheKey) {
  TempStoreDir dir;
  FileStore store(dir.path());
  try {
    store.get("missing", std::chrono::milliseconds(20));
    FAIL();
  } catch (const timeout_error& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos);
  }
}

// The largest timeout means no limit, not a deadline that wraps into the
// past (it timed out at once).
TEST(FileStore, GetWithTheLargestTimeoutWaitsForTheKey) {
  TempStoreDir dir;
  FileStore store(dir.path());
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store.set("late", "value");
  });
  std::string value;
  try {
    value = store.get("late", std::chrono::milliseconds::max());
  } catch (const timeout_error& e) {
    ADD_FAILURE() << e.what();
  }
  setter.join();
  EXPECT_EQ(value, "value");
}

// The incident: a link planted at the temp name (or the key) made set
// overwrite its target. set must replace the key, never write through a link.
TEST(FileStore, SetDoesNotFollowAPlantedSymlink) {
  TempStoreDir dir, outside;
  const std::string target = outside.path() + "/victim";
  write_file(target, "precious");
  const std::string key_path = dir.path() + "/k";
  ASSERT_EQ(::symlink(target.c_str(), key_path.c_str()), 0);
  const std::string old_tmp = key_path + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(target.c_str(), old_tmp.c_str()), 0);
  FileStore store(dir.path());
  store.set("k", "evil");
  EXPECT_EQ(read_file(target), "precious");
  EXPECT_EQ(store.get("k", kShort), "evil");  // the key is now a file of ours
}

TEST(FileStore, GetDoesNotReadThroughASymlink) {
  TempStoreDir dir, outside;
  const std::string target = outside.path() + "/secret";
  write_file(target, "secret");
  ASSERT_EQ(::symlink(target.c_str(), (dir.path() + "/k").c_str()), 0);
  FileStore store(dir.path());
  expect_refused([&] { store.get("k", kShort); }, {"'k'", "symbolic link"});
}

TEST(FileStore, ADirectoryThatIsASymlinkIsRefused) {
  TempStoreDir dir;
  const std::string real = dir.path() + "/real", link = dir.path() + "/link";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  expect_refused([&] { FileStore store(link); }, {link, "symbolic link"});
}

TEST(FileStore, ADirectoryOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  TempStoreDir dir;
  const std::string theirs = dir.path() + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  expect_refused([&] { FileStore store(theirs); }, {theirs, "owner uid 65534", "mode 0700", "another user"});
}

TEST(FileStore, AGroupOrWorldWritableDirectoryIsRefused) {
  TempStoreDir dir;
  for (mode_t mode : {0777, 01777, 0770}) {
    ASSERT_EQ(::chmod(dir.path().c_str(), mode), 0);
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    expect_refused(
        [&] { FileStore store(dir.path()); },
        {dir.path(), "owner uid " + std::to_string(::geteuid()), std::string("mode ") + octal, "writable"});
  }
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  FileStore store(dir.path());
}

TEST(FileStore, ADirectoryItCreatesIsPrivate) {
  TempStoreDir dir;
  const mode_t old_umask = ::umask(0);  // even where the umask would allow more
  const std::string made = dir.path() + "/made";
  FileStore store(made);
  ::umask(old_umask);
  struct stat st {};
  ASSERT_EQ(::lstat(made.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

TEST(FileStore, KeysCannotEscapeTheDirectory) {
  TempStoreDir parent;
  const std::string inner = parent.path() + "/store";
  FileStore store(inner);
  write_file(parent.path() + "/x", "outside");
  for (const std::string& key :
       std::initializer_list<std::string>{"", ".", "..", std::string("a\0/../x", 7)}) {
    expect_refused([&] { store.set(key, "v"); }, {"is not allowed"});
    expect_refused([&] { store.get(key, kShort); }, {"is not allowed"});
    expect_refused([&] { store.erase(key); }, {"is not allowed"});
  }
  // '/' is flattened: "../x" is a file inside the store, not the parent's x.
  store.set("../x", "inside");
  store.erase("../x");
  EXPECT_EQ(read_file(parent.path() + "/x"), "outside");
  EXPECT_THROW(store.get("../x", kShort), timeout_error);
}

TEST(FileStore, AnOversizedValueIsRefused) {
  TempStoreDir dir;
  FileStore store(dir.path());
  // A sparse file one byte over the limit, as a runaway or hostile writer leaves.
  const int fd = ::open((dir.path() + "/big").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(FileStore::kMaxValueBytes) + 1), 0);
  ::close(fd);
  expect_refused([&] { store.get("big", kShort); }, {"'big'", "larger than"});
  expect_refused([&] { store.set("big2", std::string(FileStore::kMaxValueBytes + 1, 'x')); }, {"'big2'"});
}

// What it made, it removes, files and subdirectories included; a fork()ed
// child that destroys its copy leaves the parent's directory alone.
TEST(FileStore, TempStoreDirRemovesItsDirectoryInTheOwnerOnly) {
  auto dir = std::make_unique<TempStoreDir>();
  const std::string path = dir->path();
  FileStore(path).set("k", "v");
  FileStore(path + "/sub").set("k", "v");
  const pid_t child = ::fork();
  if (child == 0) {
    dir.reset();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(exists(path + "/k"));
  dir.reset();
  EXPECT_FALSE(exists(path));
}

}  // namespace symmpool

// The descriptor channel serves only its group, and nothing a client does
// (or fails to do) stalls it: SO_PEERCRED uid and pid checks (by the server,
// and by the client of whoever listens), the secret, the wire format, and a
// deadline on every socket operation. Time limits are
// generous upper bounds; nothing asserts that something takes long.

#include "fake_fixture.hpp"
#include "process_group.hpp"

#include <symmpool/error.hpp>
#include <symmpool/fd_channel.hpp>
#include <symmpool/random_token.hpp>
#include <symmpool/store.hpp>
#include <symmpool/symmetric_heap.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace symmpool::test {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Exports a memfd holding `text` for id 7; no other id exists.
std::function<int(std::uint64_t)> export_text(const std::string& text) {
  return [text](std::uint64_t id) {
    if (id != 7) return -1;
    const int fd = ::memfd_create("fd-channel-test", MFD_CLOEXEC);
    if (fd >= 0 && ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
}

std::string read_back(int fd) {
  char buf[64] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

sockaddr_un address_of(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

// A client that talks to the server by hand. -1 when the connection fails.
int raw_connect(const std::string& name, bool nonblocking = false) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  socklen_t len = 0;
  sockaddr_un addr = address_of(name, &len);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One status byte with room for one descriptor, as the channel's replies.
struct StatusMessage {
  char status = 0;
  iovec iov{&status, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  StatusMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  StatusMessage(const StatusMessage&) = delete;  // msg points into it
  StatusMessage& operator=(const StatusMessage&) = delete;
};

// The reply's status byte (any descriptor closed), or -1 when none came
// within `wait` (the server closed without a word, or said nothing).
int read_status(int conn, milliseconds wait) {
  pollfd p{conn, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return -1;
  StatusMessage reply;
  if (::recvmsg(conn, &reply.msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  if (cmsghdr* c = CMSG_FIRSTHDR(&reply.msg); c && c->cmsg_type == SCM_RIGHTS) {
    int fd = -1;
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    ::close(fd);
  }
  return reply.status;
}

// The wire format, spelled out independently of the library.
std::string request(const std::string& secret, std::uint64_t id, char version = 1) {
  std::string req = std::string("SYMMPFD") + version + secret;
  for (int i = 0; i < 8; ++i) req += static_cast<char>((id >> (8 * i)) & 0xff);
  return req;
}

// Sends `bytes`, optionally ends the write side, then waits for the status.
int raw_exchange(const std::string& name, const std::string& bytes, bool end_write, milliseconds wait) {
  const int conn = raw_connect(name);
  if (conn < 0) return -2;
  (void)::send(conn, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (end_write) ::shutdown(conn, SHUT_WR);
  const int status = read_status(conn, wait);
  ::close(conn);
  return status;
}

constexpr int kOk = 0, kRefused = 1;

// The child's exit code, or -1 if it died or took longer than 20 s (then
// it is killed).
int wait_child(pid_t pid) {
  const auto start = Clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (ms_since(start) > 20000) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// In a child: 0 when fetching id 7 was refused, 10 when it was served,
// 20 + something else.
int fetch_outcome(const std::string& name, pid_t server_pid, const std::string& secret) {
  try {
    ::close(fetch_fd(name, server_pid, secret, 7, milliseconds(2000)));
    return 10;
  } catch (const logic_error& e) {
    return std::strstr(e.what(), "refused") ? 0 : 21;
  } catch (...) {
    return 22;
  }
}

// Forks a child that (after dropping to uid 65534 if asked) waits until the
// parent allowed its pid, then asks for id 7 with the right secret, by hand:
// fetch_fd would refuse a server of another uid before the server could.
// 0 when refused, 10 when served, 20 otherwise.
int allowed_child_outcome(FdServer& server, bool drop_uid) {
  int go[2];
  if (::pipe(go) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(go[1]);
    if (drop_uid && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(30);
    char byte = 0;
    if (::read(go[0], &byte, 1) != 1) ::_exit(31);
    const int status = raw_exchange(server.name(), request(server.secret(), 7), false, milliseconds(2000));
    ::_exit(status == kOk ? 10 : status == kRefused ? 0 : 20);
  }
  ::close(go[0]);
  server.allow_pids({::getpid(), pid});
  (void)::write(go[1], "x", 1);
  ::close(go[1]);
  return wait_child(pid);
}

// Sends status ok with `fd` attached, as a server would.
void send_ok_with(int conn, int fd) {
  StatusMessage reply;
  reply.status = kOk;
  cmsghdr* c = CMSG_FIRSTHDR(&reply.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  (void)::sendmsg(conn, &reply.msg, MSG_NOSIGNAL);
}

// Forks an impostor: a child (of uid 65534 if asked) that binds `name`, as
// anyone may once the real server is gone, reads what its first client
// sends, and answers ok with a memfd holding "impostor". Returns once the name
// is bound. Its exit code: the request bytes it got (at most 100), or 101+
// when its setup failed.
pid_t start_impostor(const std::string& name, bool drop_uid) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    if (drop_uid && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(101);
    const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = 0;
    sockaddr_un addr = address_of(name, &len);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listener, 8) != 0)
      ::_exit(102);
    (void)::write(ready[1], "x", 1);
    pollfd p{listener, POLLIN, 0};
    const int conn = ::poll(&p, 1, 5000) == 1 ? ::accept(listener, nullptr, nullptr) : -1;
    if (conn < 0) ::_exit(103);
    std::string got;
    char buf[256];
    for (pollfd q{conn, POLLIN, 0}; got.size() < request("", 0).size() + FdServer::kSecretHexChars;) {
      const ssize_t n = ::poll(&q, 1, 1000) == 1 ? ::recv(conn, buf, sizeof buf, 0) : 0;
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    const int memfd = ::memfd_create("impostor", MFD_CLOEXEC);
    if (memfd < 0 || ::write(memfd, "impostor", 8) != 8) ::_exit(104);
    send_ok_with(conn, memfd);
    ::_exit(static_cast<int>(std::min<std::size_t>(got.size(), 100)));
  }
  ::close(ready[1]);
  char byte = 0;
  if (pid > 0 && ::read(ready[0], &byte, 1) != 1) {  // the child failed before binding
    ::close(ready[0]);
    wait_child(pid);
    return -1;
  }
  ::close(ready[0]);
  return pid;
}

}  // namespace

TEST(RandomToken, IsHexOfTwiceTheLengthAndNeverRepeats) {
  const std::string a = random_token(32), b = random_token(32);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_TRUE(is_hex_token(a, 64));
  EXPECT_NE(a, b);
  EXPECT_FALSE(is_hex_token("12G4", 64));
  EXPECT_FALSE(is_hex_token("", 64));
  EXPECT_FALSE(is_hex_token("abcd", 3));
}

TEST(FdChannel, NamesAndSecretsAreRandom) {
  FdServer a(export_text("a")), b(export_text("b"));
  EXPECT_NE(a.name(), b.name());
  EXPECT_NE(a.secret(), b.secret());
  EXPECT_EQ(a.name().rfind("symmpool-", 0), 0u) << a.name();
  EXPECT_LE(a.name().size(), FdServer::kMaxNameChars);
  EXPECT_EQ(a.secret().size(), FdServer::kSecretHexChars);
  EXPECT_TRUE(is_hex_token(a.secret(), FdServer::kSecretHexChars));
}

TEST(FdChannel, AnAllowedPidWithTheSecretGetsTheDescriptor) {
  FdServer server(export_text("payload"));
  server.allow_pids({::getpid()});
  EXPECT_EQ(read_back(fetch_fd(server.name(), ::getpid(), server.secret(), 7, milliseconds(2000))),
            "payload");
  try {
    fetch_fd(server.name(), ::getpid(), server.secret(), 8, milliseconds(2000));
    FAIL() << "id 8 served";
  } catch (const logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no such descriptor"), std::string::npos) << what;
    EXPECT_NE(what.find("@" + server.name()), std::string::npos) << what;
    EXPECT_NE(what.find("id 8"), std::string::npos) << what;
  }
}

TEST(FdChannel, NobodyIsServedBeforeAllowPids) {
  FdServer server(export_text("payload"));
  EXPECT_EQ(fetch_outcome(server.name(), ::getpid(), server.secret()), 0);
}

TEST(FdChannel, AWrongSecretIsRefused) {
  FdServer server(export_text("payload"));
  server.allow_pids({::getpid()});
  try {
    fetch_fd(server.name(), ::getpid(), random_token(FdServer::kSecretBytes), 7, milliseconds(2000));
    FAIL() << "served with a wrong secret";
  } catch (const logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("refused"), std::string::npos) << what;
    EXPECT_NE(what.find("@" + server.name()), std::string::npos) << what;
    EXPECT_NE(what.find("id 7"), std::string::npos) << what;
  }
  // A secret of the wrong length never leaves the client.
  EXPECT_THROW(fetch_fd(server.name(), ::getpid(), "abc", 7, milliseconds(2000)), logic_error);
}

TEST(FdChannel, APidOutsideTheAllowedSetIsRefused) {
  FdServer server(export_text("payload"));
  const pid_t parent = ::getpid();
  server.allow_pids({parent});  // not the child's
  const pid_t child = ::fork();
  if (child == 0) ::_exit(fetch_outcome(server.name(), parent, server.secret()));
  ASSERT_GT(child, 0);
  EXPECT_EQ(wait_child(child), 0) << "a forked child outside the allowed pids was not refused";
}

TEST(FdChannel, AnotherUidIsRefusedEvenWithAnAllowedPidAndTheSecret) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to run a child as uid 65534 (the tests run as root in CI)";
  FdServer server(export_text("payload"));
  EXPECT_EQ(allowed_child_outcome(server, /*drop_uid=*/false), 10)
      << "the same-uid control child was not served";
  EXPECT_EQ(allowed_child_outcome(server, /*drop_uid=*/true), 0) << "uid 65534 was not refused";
}

// The server's name is free once it is gone, and anyone may bind it. A
// socket of another uid, even at the expected pid, gets no secret and
// serves us nothing.
TEST(FdChannel, ASocketOfAnotherUidGetsNoSecretAndServesNothing) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to run a child as uid 65534 (the tests run as root in CI)";
  const std::string name = "symmpool-" + random_token(16);
  const pid_t impostor = start_impostor(name, /*drop_uid=*/true);
  ASSERT_GT(impostor, 0);
  try {
    const int fd = fetch_fd(name, impostor, random_token(FdServer::kSecretBytes), 7, milliseconds(2000));
    ADD_FAILURE() << "imported '" << read_back(fd) << "' from a socket of uid 65534";
  } catch (const logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("@" + name), std::string::npos) << what;
    EXPECT_NE(what.find("uid 65534 pid " + std::to_string(impostor)), std::string::npos) << what;
    EXPECT_NE(what.find("uid 0 pid " + std::to_string(impostor)), std::string::npos) << what;
  }
  EXPECT_EQ(wait_child(impostor), 0) << "request bytes (the secret) reached the impostor";
}

// Same uid, another process than the peer we mean: refused alike.
TEST(FdChannel, ASocketOfAnotherPidGetsNoSecretAndServesNothing) {
  const std::string name = "symmpool-" + random_token(16);
  const pid_t impostor = start_impostor(name, /*drop_uid=*/false);
  ASSERT_GT(impostor, 0);
  const std::string uid = "uid " + std::to_string(::geteuid());
  try {
    const int fd = fetch_fd(name, ::getpid(), random_token(FdServer::kSecretBytes), 7, milliseconds(2000));
    ADD_FAILURE() << "imported '" << read_back(fd) << "' from pid " << impostor << ", not the expected "
                  << ::getpid();
  } catch (const logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("@" + name), std::string::npos) << what;
    EXPECT_NE(what.find(uid + " pid " + std::to_string(impostor)), std::string::npos) << what;
    EXPECT_NE(what.find(uid + " pid " + std::to_string(::getpid())), std::string::npos) << what;
  }
  EXPECT_EQ(wait_child(impostor), 0) << "request bytes (the secret) reached the impostor";

  // Control: at the expected pid, the same impostor serves and gets the request.
  const std::string name2 = "symmpool-" + random_token(16);
  const pid_t expected = start_impostor(name2, /*drop_uid=*/false);
  ASSERT_GT(expected, 0);
  EXPECT_EQ(read_back(fetch_fd(name2, expected, random_token(FdServer::kSecretBytes), 7, milliseconds(2000))),
            "impostor");
  EXPECT_EQ(wait_child(expected), static_cast<int>(request("", 0).size() + FdServer::kSecretHexChars));
}

// A fork()ed child shares the server's wake pipe and holds a copy of its
// thread (one that does not run in the child). Destroying that copy must
// neither stop the parent's server nor hang or abort the child.
TEST(FdChannel, AForkedChildDestroyingItsCopyLeavesTheServerServing) {
  auto server = std::make_unique<FdServer>(export_text("payload"));
  server->allow_pids({::getpid()});
  const pid_t child = ::fork();
  if (child == 0) {
    server.reset();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(wait_child(child), 0) << "the child's destructor hung or aborted";
  std::this_thread::sleep_for(milliseconds(50));  // time for a woken server to stop, were it to
  EXPECT_EQ(read_back(fetch_fd(server->name(), ::getpid(), server->secret(), 7, milliseconds(2000))),
            "payload");
}

TEST(FdChannel, ASilentClientDoesNotDelayOthers) {
  FdServer server(export_text("payload"), FdServerOptions{std::chrono::seconds(30)});
  server.allow_pids({::getpid()});
  const int silent = raw_connect(server.name());
  ASSERT_GE(silent, 0);
  std::this_thread::sleep_for(milliseconds(50));  // accepted by now
  const auto start = Clock::now();
  EXPECT_EQ(read_back(fetch_fd(server.name(), ::getpid(), server.secret(), 7, milliseconds(5000))),
            "payload");
  EXPECT_LT(ms_since(start), 2000);
  ::close(silent);
}

TEST(FdChannel, TheDestructorReturnsPromptlyWithASilentClient) {
  auto server = std::make_unique<FdServer>(export_text("payload"), FdServerOptions{std::chrono::seconds(30)});
  server->allow_pids({::getpid()});
  const int silent = raw_connect(server->name());
  ASSERT_GE(silent, 0);
  ASSERT_EQ(::send(silent, "SYMM", 4, MSG_NOSIGNAL), 4);  // half a request, then silence
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  server.reset();
  EXPECT_LT(ms_since(start), 1000);
  ::close(silent);
}

TEST(FdChannel, ManySilentClientsNeitherHangTheServerNorItsDestructor) {
  auto server = std::make_unique<FdServer>(export_text("payload"), FdServerOptions{milliseconds(200)});
  server->allow_pids({::getpid()});
  std::vector<int> silent;
  for (int i = 0; i < 200; ++i)  // more than the backlog and the server's open connections
    if (int fd = raw_connect(server->name(), /*nonblocking=*/true); fd >= 0) silent.push_back(fd);
  ASSERT_GE(silent.size(), 64u);
  auto start = Clock::now();
  EXPECT_EQ(read_back(fetch_fd(server->name(), ::getpid(), server->secret(), 7, milliseconds(10000))),
            "payload");
  EXPECT_LT(ms_since(start), 8000);
  for (int i = 0; i < 150; ++i)
    if (int fd = raw_connect(server->name(), /*nonblocking=*/true); fd >= 0) silent.push_back(fd);
  start = Clock::now();
  server.reset();
  EXPECT_LT(ms_since(start), 1000);
  for (int fd : silent) ::close(fd);
}

TEST(FdChannel, MalformedRequestsAreRefusedWithinTheDeadline) {
  FdServer server(export_text("payload"), FdServerOptions{milliseconds(300)});
  server.allow_pids({::getpid()});
  const milliseconds wait(2000);
  // The hand-made request is right, so the refusals below are about the flaw.
  EXPECT_EQ(raw_exchange(server.name(), request(server.secret(), 7), false, wait), kOk);

  auto start = Clock::now();
  EXPECT_EQ(raw_exchange(server.name(), request(server.secret(), 7).substr(0, 10), false, wait), kRefused)
      << "short, then silent";
  EXPECT_LT(ms_since(start), 1500);
  start = Clock::now();
  EXPECT_EQ(raw_exchange(server.name(), request(server.secret(), 7).substr(0, 50), true, wait), kRefused)
      << "short, then closed";
  EXPECT_LT(ms_since(start), 1500);
  std::string wrong_magic = request(server.secret(), 7);
  wrong_magic[0] = 'X';
  EXPECT_EQ(raw_exchange(server.name(), wrong_magic, false, wait), kRefused) << "wrong magic";
  EXPECT_EQ(raw_exchange(server.name(), request(server.secret(), 7, /*version=*/2), false, wait), kRefused)
      << "wrong version";
  EXPECT_EQ(raw_exchange(server.name(),
                         std::string(request("", 0).size() + FdServer::kSecretHexChars, '\xff'), false, wait),
            kRefused)
      << "garbage";
  EXPECT_EQ(raw_exchange(server.name(), request(std::string(FdServer::kSecretHexChars, 'z'), 7), false, wait),
            kRefused)
      << "non-hex secret";
  EXPECT_EQ(raw_exchange(server.name(), std::string(4096, 'A'), false, wait), kRefused) << "too long";
  EXPECT_EQ(raw_exchange(server.name(), "", true, wait), kRefused) << "empty";
  EXPECT_LT(ms_since(start), 8000);
  // And the server still serves.
  EXPECT_EQ(read_back(fetch_fd(server.name(), ::getpid(), server.secret(), 7, milliseconds(2000))),
            "payload");
}

TEST(FdChannel, FetchingFromNobodyTimesOutNamingTheSocketAndId) {
  const std::string name = "symmpool-" + random_token(16);
  const auto start = Clock::now();
  try {
    fetch_fd(name, ::getpid(), random_token(FdServer::kSecretBytes), 42, milliseconds(200));
    FAIL() << "fetched from nobody";
  } catch (const timeout_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("@" + name), std::string::npos) << what;
    EXPECT_NE(what.find("id 42"), std::string::npos) << what;
  }
  EXPECT_LT(ms_since(start), 1500);
}

// In the heap a peer binds its socket before it publishes the name, so
// nobody listening there means the peer is gone: waiting cannot help.
TEST(FdChannel, NobodyListeningFailsAtOnceWhenThePeerWasUp) {
  const std::string name = "symmpool-" + random_token(16);
  const auto start = Clock::now();
  try {
    fetch_fd(name, ::getpid(), random_token(FdServer::kSecretBytes), 42, milliseconds(5000),
             IfNobodyListens::kPeerGone);
    FAIL() << "fetched from nobody";
  } catch (const timeout_error& e) {
    ADD_FAILURE() << "waited for the timeout: " << e.what();
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("@" + name), std::string::npos) << what;
    EXPECT_NE(what.find("id 42"), std::string::npos) << what;
    EXPECT_NE(what.find("nobody listens"), std::string::npos) << what;
  }
  EXPECT_LT(ms_since(start), 1000);
}

// The largest timeout means no limit, not a deadline that wraps into the
// past. The answer takes a while, so a deadline already past would show.
TEST(FdChannel, TheLargestTimeoutWaitsForTheAnswer) {
  FdServer server([](std::uint64_t id) {
    std::this_thread::sleep_for(milliseconds(50));
    return export_text("slow")(id);
  });
  server.allow_pids({::getpid()});
  EXPECT_EQ(read_back(fetch_fd(server.name(), ::getpid(), server.secret(), 7, milliseconds::max())), "slow");

  // And a server's io timeout: its clients' deadlines must not be past.
  FdServer patient(export_text("payload"), FdServerOptions{milliseconds::max()});
  patient.allow_pids({::getpid()});
  EXPECT_EQ(read_back(fetch_fd(patient.name(), ::getpid(), patient.secret(), 7, milliseconds(2000))),
            "payload");
}

// A socket that listens but never accepts: connect and send succeed, no
// reply ever comes. A 0 ms timeout must not mean "wait forever".
TEST(FdChannel, AZeroTimeoutDoesNotWaitForever) {
  const std::string name = "symmpool-" + random_token(16);
  const int mute = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = 0;
  sockaddr_un addr = address_of(name, &len);
  ASSERT_EQ(::bind(mute, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(mute, 8), 0);
  const std::string secret = random_token(FdServer::kSecretBytes);
  auto start = Clock::now();
  EXPECT_THROW(fetch_fd(name, ::getpid(), secret, 1, milliseconds(0)), timeout_error);
  EXPECT_LT(ms_since(start), 1000);
  start = Clock::now();
  EXPECT_THROW(fetch_fd(name, ::getpid(), secret, 1, milliseconds(100)), timeout_error);
  EXPECT_LT(ms_since(start), 1500);
  ::close(mute);

  // A server whose io timeout is 0 drops a silent client at once, too.
  FdServer server(export_text("payload"), FdServerOptions{milliseconds(0)});
  server.allow_pids({::getpid()});
  start = Clock::now();
  EXPECT_EQ(raw_exchange(server.name(), "", false, milliseconds(2000)), kRefused);
  EXPECT_LT(ms_since(start), 1500);
}

// With no descriptor left, accept4 fails with EMFILE and the connection
// stays in the backlog, so poll reports it again at once: the server must
// back off instead of spinning, and serve the client once descriptors free up.
// In a child, whose descriptor limit is lowered and then used up.
TEST(FdChannel, RunningOutOfDescriptorsDoesNotSpinTheServer) {
  const pid_t child = ::fork();
  if (child == 0) {
    FdServer server(export_text("payload"), FdServerOptions{std::chrono::seconds(10)});
    server.allow_pids({::getpid()});
    int highest = 0;
    for (int fd = 0; fd < 4096; ++fd)
      if (::fcntl(fd, F_GETFD) >= 0) highest = fd;
    rlimit limit{static_cast<rlim_t>(highest + 32), static_cast<rlim_t>(highest + 32)};
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(40);
    std::vector<int> filler;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) filler.push_back(fd);
    if (errno != EMFILE || filler.size() < 16) ::_exit(40);
    ::close(filler.back());  // room for the client's socket only
    filler.pop_back();
    const int conn = raw_connect(server.name());
    if (conn < 0) ::_exit(41);
    timespec before{}, after{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &before);
    std::this_thread::sleep_for(milliseconds(300));
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &after);
    const double cpu_ms = (after.tv_sec - before.tv_sec) * 1e3 + (after.tv_nsec - before.tv_nsec) / 1e6;
    for (int i = 0; i < 8; ++i) {  // the server's accepted socket, the exported memfd, ours
      ::close(filler.back());
      filler.pop_back();
    }
    const std::string req = request(server.secret(), 7);
    if (::send(conn, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) ::_exit(42);
    const int status = read_status(conn, milliseconds(3000));
    if (cpu_ms > 150) ::_exit(43);  // 300 ms of spinning would show as ~300 ms
    ::_exit(status == kOk ? 0 : 44);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(wait_child(child), 0)
      << "40-42: setup failed, 43: the server spun on EMFILE, 44: not served after";
}

// --- The channel inside the symmetric heap (fake driver, real processes).

namespace {

std::unique_ptr<CachingAllocator> heap_allocator(int device) {
  FakeDriver::instance().reset(3);
  ArenaOptions options;
  options.env = Environment{};
  return std::make_unique<CachingAllocator>(
      std::make_unique<SegmentArena>(FakeDriver::instance().api(), device, options));
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find_first_of(" \n", start);
    if (end == std::string::npos) end = text.size();
    if (end > start) words.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

}  // namespace

// Rank 1 never runs: its hello (written by hand) has a bad field. Rank 0
// names rank 1 and the field, and does not print the hello (it holds a secret).
TEST(SymmetricHeapChannel, AMalformedHelloIsRefusedNamingTheRankAndField) {
  const std::string secret = random_token(FdServer::kSecretBytes);
  const std::string good_socket = "symmpool-" + random_token(16);
  struct Case {
    std::string hello, expected;
  } cases[] = {
      {"n 1 pci " + good_socket + " " + secret + " -5", "the pid is not a positive integer"},
      {"n 1 pci " + good_socket + " " + secret + " 12x", "the pid is not a positive integer"},
      {"n 1 pci " + good_socket + " " + secret.substr(2) + " 123", "the secret is not 64 hex characters"},
      {"n 1 pci " + good_socket + " " + std::string(64, 'G') + " 123", "the secret is not 64 hex characters"},
      {"n 1 pci symmpool-../x " + secret + " 123", "the socket name is not symmpool-<hex>"},
      {"n 1 pci symmpool-" + std::string(200, 'a') + " " + secret + " 123",
       "the socket name is not symmpool-<hex>"},
      {"n 1 pci " + good_socket, "4 fields, not 6"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string group = "badhello" + std::to_string(i++);
    const TempStoreDir dir;  // removed at the end of each case
    FileStore store(dir.path());
    store.set("symmpool/" + group + "/0/round/0/1", "hello\n" + c.hello);  // instance 0: its first heap here
    auto alloc = heap_allocator(0);
    try {
      SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, group, 0, 2,
                         HeapOptions{std::chrono::seconds(5)});
      ADD_FAILURE() << "heap formed with hello '" << c.hello << "'";
    } catch (const logic_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 1 sent a malformed hello: " + c.expected), std::string::npos) << what;
      EXPECT_EQ(what.find(secret), std::string::npos) << "the secret leaked into: " << what;
    }
  }
}

// export_fd hands out only what sync() published: rank 0 maps a second
// segment after its sync, and rank 1, holding rank 0's socket and secret,
// can fetch exactly the published one.
TEST(SymmetricHeapChannel, OnlyPublishedSegmentsAreServed) {
  const TempStoreDir dir;  // removed when the test ends, after its ranks
  std::string result = run_ranks(2, 60, [&](int rank, int w, Rendezvous&) {
    auto alloc = heap_allocator(rank);
    FileStore store(dir.path());
    SymmetricHeap heap(FakeDriver::instance().api(), *alloc, store, "pub", rank, w,
                       HeapOptions{std::chrono::seconds(20)});
    if (rank == 0) {
      void* a = alloc->allocate(4096, stream(1));
      heap.sync();
      void* unpublished = alloc->allocate(30 * MiB, stream(1));  // a segment of its own
      store.set("test/ready", "");
      store.get("test/done", std::chrono::seconds(20));
      alloc->deallocate(unpublished, stream(1));
      alloc->deallocate(a, stream(1));
      return 0;
    }
    // Rank 0 erases its hello only after this rank's second sync-round key.
    const auto hello = words_of(store.get("symmpool/pub/0/round/0/0", std::chrono::seconds(5)));
    if (hello.size() != 7) return 2;  // "hello" + 6 fields, the last rank 0's pid
    heap.sync();
    store.get("test/ready", std::chrono::seconds(20));
    std::size_t served = 0;
    for (std::uint64_t id = 0; id < 64; ++id) {
      try {
        ::close(
            fetch_fd(hello[4], static_cast<pid_t>(std::stol(hello[6])), hello[5], id, milliseconds(2000)));
        ++served;
      } catch (const logic_error&) {  // no such descriptor
      }
    }
    store.set("test/done", "");
    if (served != heap.mapped_peer_segments() || served != 1) {
      std::fprintf(stderr, "[rank 1] %zu segments served, %zu published\n", served,
                   heap.mapped_peer_segments());
      return 1;
    }
    return 0;
  });
  EXPECT_EQ(result, "");
}

}  // namespace symmpool::test

// The memory driver, reached only through the URL registry: memory://NAME is one store per
// process and name, read and written like any other.
#include <gtest/gtest.h>

#include <string>

#include "storage/remote_object.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(MemoryStore, OneStorePerNameThroughTheRegistry) {
  auto store = open_store("memory://registry-test");
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  EXPECT_EQ((*store)->describe(), "memory://registry-test");
  ASSERT_TRUE((*store)->make_directory("ds", Deadline::none()).is_ok());
  ASSERT_TRUE((*store)->put("ds/a.bin", as_bytes("hello"), Deadline::none()).is_ok());

  // A second open of the same name sees the same objects; another name is empty.
  auto again = open_store("memory://registry-test");
  ASSERT_TRUE(again.is_ok());
  auto names = (*again)->list("ds", Deadline::none());
  ASSERT_TRUE(names.is_ok()) << names.status().to_string();
  EXPECT_EQ(names.value(), std::vector<std::string>{"a.bin"});
  auto other = open_store("memory://registry-test-other");
  ASSERT_TRUE(other.is_ok());
  EXPECT_FALSE((*other)->exists("ds/a.bin", Deadline::none()).value());

  // The object's bytes through open_source, as a reader given the URL gets them.
  auto source = open_source("memory://registry-test/ds/a.bin", IoBackend::kPread,
                            Deadline::after(std::chrono::seconds(5)));
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_EQ((*source)->name(), "memory://registry-test/ds/a.bin");
  std::string text(5, '\0');
  ASSERT_TRUE(
      (*source)->read_at(0, std::as_writable_bytes(std::span(text.data(), text.size()))).is_ok());
  EXPECT_EQ(text, "hello");

  auto missing = open_source("memory://registry-test/ds/none", IoBackend::kPread, Deadline::none());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound) << missing.status().to_string();
  EXPECT_NE(missing.status().message().find("memory://registry-test/ds/none"), std::string::npos)
      << missing.status().message();
}

TEST(MemoryStore, AURLWithoutANameIsRefused) {
  auto store = open_store("memory://");
  EXPECT_EQ(store.status().code(), ErrorCode::kInvalidArgument) << store.status().to_string();
  EXPECT_NE(store.status().message().find("memory://NAME"), std::string::npos);
}

// The registry's remote answers come from its table: memory:// is registered but fetched over no
// network (so no cache fronts it), and an unregistered scheme is refused rather than sent to
// some client.
TEST(MemoryStore, IsNotRemoteAndTheRemoteCallsRefuseIt) {
  EXPECT_TRUE(internal::is_remote_url("https://host/ds/manifest.json"));
  EXPECT_TRUE(internal::is_remote_url("HTTP://host/a.tar"));
  EXPECT_TRUE(internal::is_remote_url("S3://bucket/key"));
  EXPECT_TRUE(internal::is_s3_url("S3://bucket/key"));
  EXPECT_FALSE(internal::is_s3_url("https://host/key"));
  EXPECT_FALSE(internal::is_remote_url("memory://registry-test/ds/a.bin"));
  EXPECT_FALSE(internal::is_remote_url("/data/ds/a.zws"));
  EXPECT_FALSE(internal::is_remote_url("ftp://host/a.zws"));

  for (const std::string url : {"memory://registry-test/ds/a.bin", "ftp://host/a.zws"}) {
    auto source = internal::open_remote_source(url, Deadline::none());
    EXPECT_EQ(source.status().code(), ErrorCode::kInvalidArgument) << url;
    EXPECT_NE(source.status().message().find(url), std::string::npos)
        << source.status().message();
    auto whole = internal::read_remote_object(url, Deadline::none());
    EXPECT_EQ(whole.status().code(), ErrorCode::kInvalidArgument) << url;
  }
}

}  // namespace
}  // namespace zerowait
